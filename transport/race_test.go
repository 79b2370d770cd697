//go:build race

package transport_test

// raceEnabled scales heavy tests down under the race detector, which slows
// protobuf encoding about 15×; without -race they run at full size.
const raceEnabled = true
