//go:build !race

package racesupp

const raceEnabled = false
