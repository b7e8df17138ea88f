$MESHC examples/gpt2.mesh
