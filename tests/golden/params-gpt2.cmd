$MESHC --dump=params examples/gpt2.mesh
