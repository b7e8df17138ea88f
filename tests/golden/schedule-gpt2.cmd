$MESHC --dump=schedule examples/gpt2.mesh
