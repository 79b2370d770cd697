package partition

// AheadRead reports whether rcpt's stream has read its next emission
// ahead and the read has ended.
func (r *Relay) AheadRead(rcpt string) bool {
	r.ahead.mu.Lock()
	defer r.ahead.mu.Unlock()
	for st, a := range r.ahead.m {
		if st.rcpt != rcpt {
			continue
		}
		select {
		case <-a.done:
			return true
		default:
		}
	}
	return false
}
