cp examples/gpt-tiny.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC --set model.dim=48 gpt-tiny.mesh
