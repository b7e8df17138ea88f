$MESHC --stats examples/moe.mesh
