$MESHC tests/golden/snippets/attention.mesh
