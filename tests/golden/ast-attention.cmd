$MESHC --dump=ast tests/golden/snippets/attention.mesh
