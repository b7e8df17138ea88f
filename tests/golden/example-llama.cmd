cp examples/llama.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC llama.mesh
