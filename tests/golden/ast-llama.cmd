$MESHC --dump=ast examples/llama.mesh
