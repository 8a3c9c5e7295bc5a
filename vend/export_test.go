package vend

// ParseArgsForTest exposes parseArgs to the fuzz target.
var ParseArgsForTest = parseArgs
