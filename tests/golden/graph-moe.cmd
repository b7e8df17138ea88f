$MESHC --dump=graph examples/moe.mesh
