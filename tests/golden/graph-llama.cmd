$MESHC --dump=graph examples/llama.mesh
