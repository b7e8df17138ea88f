$MESHC --dump=ast examples/moe.mesh
