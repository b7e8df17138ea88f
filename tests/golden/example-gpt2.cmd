cp examples/gpt2.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC gpt2.mesh
