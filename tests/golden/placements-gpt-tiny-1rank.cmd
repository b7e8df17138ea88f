$MESHC --dump=placements examples/gpt-tiny.mesh
