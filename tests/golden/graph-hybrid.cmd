$MESHC --dump=graph tests/golden/snippets/hybrid.mesh
