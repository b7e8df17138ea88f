cp examples/moe.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC moe.mesh
