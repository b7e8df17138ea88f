$MESHC examples/moe.mesh
