$MESHC --dump=params examples/moe.mesh
