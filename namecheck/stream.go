package namecheck

// Stream reassembles the first MaxBytes bytes of a TCP flow by sequence
// number. The zero Stream is not ready: use NewStream.
type Stream struct {
	start uint32 // the sequence number of the flow's first byte (ISN+1)
	buf   []byte
	have  []bool
	next  int // bytes known contiguously from start
}

// NewStream starts a stream whose first byte has sequence number start.
func NewStream(start uint32) *Stream { return &Stream{start: start} }

// Add records a segment's payload at sequence number seq. It reports a
// conflict when a byte seen before arrives with another value (the
// server could read either: refuse), and over when the segment reaches
// past MaxBytes (the name did not come within the bound). Bytes before
// the start are ignored (a retransmitted SYN's sequence number).
func (s *Stream) Add(seq uint32, payload []byte) (conflict, over bool) {
	off := int64(int32(seq - s.start))
	if off < 0 {
		if -off >= int64(len(payload)) {
			return false, false
		}
		payload = payload[-off:]
		off = 0
	}
	end := off + int64(len(payload))
	if end > MaxBytes {
		return false, true
	}
	if int(end) > len(s.buf) {
		s.buf = append(s.buf, make([]byte, int(end)-len(s.buf))...)
		s.have = append(s.have, make([]bool, int(end)-len(s.have))...)
	}
	for i, c := range payload {
		j := int(off) + i
		if s.have[j] {
			if s.buf[j] != c {
				return true, false
			}
			continue
		}
		s.buf[j], s.have[j] = c, true
	}
	for s.next < len(s.have) && s.have[s.next] {
		s.next++
	}
	return false, false
}

// Matches reports whether a segment agrees with every byte the stream
// holds where they overlap (bytes it does not hold are new, and agree).
func (s *Stream) Matches(seq uint32, payload []byte) bool {
	off := int64(int32(seq - s.start))
	for i, c := range payload {
		j := off + int64(i)
		if j < 0 || j >= int64(len(s.buf)) {
			continue
		}
		if s.have[j] && s.buf[j] != c {
			return false
		}
	}
	return true
}

// Prefix is the contiguous bytes from the flow's first on.
func (s *Stream) Prefix() []byte { return s.buf[:s.next] }

// Len is how many bytes the stream holds, contiguous or not.
func (s *Stream) Len() int { return len(s.buf) }
