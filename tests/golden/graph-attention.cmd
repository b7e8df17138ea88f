$MESHC --dump=graph tests/golden/snippets/attention.mesh
