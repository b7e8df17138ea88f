$MESHC --dump=ast tests/golden/snippets/blocks.mesh
