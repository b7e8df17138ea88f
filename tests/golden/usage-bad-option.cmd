$MESHC --frobnicate examples/gpt2.mesh
