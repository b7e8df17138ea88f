$MESHC --stats examples/gpt2.mesh
