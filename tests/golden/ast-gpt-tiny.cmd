$MESHC --dump=ast examples/gpt-tiny.mesh
