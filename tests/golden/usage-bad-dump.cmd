$MESHC --dump=tree examples/gpt2.mesh
