$MESHC examples/llama.mesh
