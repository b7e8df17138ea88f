$MESHC --stats examples/llama.mesh
