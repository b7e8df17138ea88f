$MESHC --dump=placements examples/moe.mesh
