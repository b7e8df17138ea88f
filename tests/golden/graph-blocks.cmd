$MESHC --dump=graph tests/golden/snippets/blocks.mesh
