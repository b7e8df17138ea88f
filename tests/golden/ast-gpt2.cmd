$MESHC --dump=ast examples/gpt2.mesh
