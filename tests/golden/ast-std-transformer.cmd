$MESHC --dump=ast lang/std/transformer.mesh
