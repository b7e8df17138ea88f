$MESHC --dump=params examples/gpt-tiny.mesh
