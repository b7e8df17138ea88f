$MESHC --check examples/llama.mesh
