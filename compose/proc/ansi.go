package proc

// StripANSI removes terminal control sequences from a line of output:
// CSI sequences (colours, cursor moves: ESC [ ... final byte), OSC
// sequences (titles, hyperlinks: ESC ] ... BEL or ESC \), other two-byte
// escapes, and the C1 single-byte CSI introducer. Logs are read by people
// and by tools that do not interpret them.
func StripANSI(b []byte) []byte {
	if !hasEscape(b) {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		if c != 0x1b {
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(b) {
			break // a lone ESC at the end
		}
		switch b[i+1] {
		case '[':
			i = skipCSI(b, i+2)
		case ']', 'P', '_', '^', 'X':
			// OSC, DCS, APC, PM, SOS: a string ended by BEL or ST (ESC \).
			i = skipString(b, i+2)
		default:
			// ESC followed by intermediates (0x20-0x2f) and one final
			// byte, e.g. ESC ( B.
			j := i + 1
			for j < len(b) && b[j] >= 0x20 && b[j] <= 0x2f {
				j++
			}
			if j < len(b) {
				j++
			}
			i = j
		}
	}
	return out
}

func hasEscape(b []byte) bool {
	for _, c := range b {
		if c == 0x1b {
			return true
		}
	}
	return false
}

// skipCSI skips parameter (0x30-0x3f) and intermediate (0x20-0x2f) bytes and
// the final byte (0x40-0x7e) of a CSI sequence starting at i.
func skipCSI(b []byte, i int) int {
	for i < len(b) && b[i] >= 0x20 && b[i] <= 0x3f {
		i++
	}
	if i < len(b) && b[i] >= 0x40 && b[i] <= 0x7e {
		i++
	}
	return i
}

func skipString(b []byte, i int) int {
	for i < len(b) {
		switch {
		case b[i] == 0x07:
			return i + 1
		case b[i] == 0x1b && i+1 < len(b) && b[i+1] == '\\':
			return i + 2
		}
		i++
	}
	return i
}
