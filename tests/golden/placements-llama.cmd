$MESHC --dump=placements examples/llama.mesh
