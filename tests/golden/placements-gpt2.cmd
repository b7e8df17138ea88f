$MESHC --dump=placements examples/gpt2.mesh
