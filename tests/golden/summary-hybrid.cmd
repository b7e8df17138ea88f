cp tests/golden/snippets/hybrid.mesh "$SCRATCH" && cd "$SCRATCH" && $MESHC hybrid.mesh
