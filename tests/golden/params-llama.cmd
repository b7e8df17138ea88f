$MESHC --dump=params examples/llama.mesh
