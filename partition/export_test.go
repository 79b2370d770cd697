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

// OnFollow hears each decision whether to send a stream's next emission
// before the receipts of the one in flight, whose highest sequence is top.
// Call it before Start.
func (r *Relay) OnFollow(fn func(top uint64, sent bool)) { r.onFollow = fn }
