$MESHC --dump=graph examples/gpt2.mesh
