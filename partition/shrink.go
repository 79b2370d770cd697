package partition

// Go maps never give back the memory of deleted entries: a map that once
// held a churning fleet's ten thousand peers keeps their buckets after
// they all left. The relay's per-peer and per-stream maps therefore drop
// entries through shrinkDelete, which copies a map into a fresh one once
// it holds a quarter of its peak. The copy costs O(len) and happens after
// at least 3/4 of the peak was deleted, so it is O(1) per delete amortised.

// minShrink: smaller maps are not worth copying.
const minShrink = 64

// shrinkDelete deletes k from *m and, when *m has fallen to a quarter of
// *peak (the most entries seen at a delete), replaces it with a copy.
func shrinkDelete[K comparable, V any](m *map[K]V, peak *int, k K) {
	*peak = max(*peak, len(*m))
	delete(*m, k)
	if *peak < minShrink || len(*m) > *peak/4 {
		return
	}
	fresh := make(map[K]V, len(*m))
	for k, v := range *m {
		fresh[k] = v
	}
	*m, *peak = fresh, len(fresh)
}
