$MESHC --dump=ast tests/golden/snippets/hybrid.mesh
