$MESHC --dump=params tests/golden/snippets/blocks.mesh
