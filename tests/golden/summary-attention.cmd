cp tests/golden/snippets/attention.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC attention.mesh
