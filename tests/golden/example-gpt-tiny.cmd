cp examples/gpt-tiny.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC gpt-tiny.mesh
