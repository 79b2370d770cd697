package testnet

import "fmt"

// Isolate cuts daemon i off from every other by taking its link to the
// bridge down (WithNetns only; ErrNoNetns otherwise). Gossip and QUIC
// both stop; the daemon keeps running and its admin API stays reachable.
func (c *ProcCluster) Isolate(i int) error {
	if c.ns == nil {
		return fmt.Errorf("testnet: isolate: %w: cluster started without WithNetns", ErrNoNetns)
	}
	if _, err := c.get(i); err != nil {
		return err
	}
	return c.ns.setLink(i, false)
}

// Heal brings every daemon's link up again (WithNetns only).
func (c *ProcCluster) Heal() error {
	if c.ns == nil {
		return fmt.Errorf("testnet: heal: %w: cluster started without WithNetns", ErrNoNetns)
	}
	for i := range c.Len() {
		if err := c.ns.setLink(i, true); err != nil {
			return err
		}
	}
	return nil
}
