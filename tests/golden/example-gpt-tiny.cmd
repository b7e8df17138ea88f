$MESHC examples/gpt-tiny.mesh
