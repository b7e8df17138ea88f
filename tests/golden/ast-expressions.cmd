$MESHC --dump=ast tests/golden/snippets/expressions.mesh
