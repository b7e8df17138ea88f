$MESHC tests/golden/snippets/hybrid.mesh
