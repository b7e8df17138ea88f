$MESHC lang/std/transformer.mesh
