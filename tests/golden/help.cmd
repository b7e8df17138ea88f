$MESHC --help
