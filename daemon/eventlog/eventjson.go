package eventlog

import (
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/enforcerd/enforcerd/api"
)

// appendEventJSON appends ev and a newline, byte for byte as a
// json.Encoder with SetEscapeHTML(false) writes it, and reports true; or
// appends nothing and reports false for what it does not know (a Detail
// value of a type other than the ones the daemon records, a time outside
// years 0-9999, a NaN or infinite number): the caller encodes those with
// encoding/json. Every DNS answer's event passes here, and reflection was
// the event writer's largest cost under a flood. TestEventJSONMatches and
// FuzzEventJSON hold it to encoding/json's output.
func appendEventJSON(b []byte, ev *api.Event) ([]byte, bool) {
	start := len(b)
	if y := ev.Time.Year(); y < 0 || y > 9999 {
		return b, false
	}
	b = append(b, `{"time":"`...)
	b = ev.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","session":`...)
	b = appendJSONString(b, ev.Session)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, ev.Kind)
	if ev.Action != "" {
		b = append(b, `,"action":`...)
		b = appendJSONString(b, ev.Action)
	}
	if c := ev.Caller; c != nil {
		b = append(b, `,"caller":{"uid":`...)
		b = strconv.AppendUint(b, uint64(c.UID), 10)
		b = append(b, `,"gid":`...)
		b = strconv.AppendUint(b, uint64(c.GID), 10)
		b = append(b, `,"pid":`...)
		b = strconv.AppendInt(b, int64(c.PID), 10)
		b = append(b, '}')
	}
	if len(ev.Detail) > 0 {
		b = append(b, `,"detail":{`...)
		keys := make([]string, 0, len(ev.Detail))
		for k := range ev.Detail {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			var ok bool
			if b, ok = appendJSONValue(b, ev.Detail[k]); !ok {
				return b[:start], false
			}
		}
		b = append(b, '}')
	}
	return append(b, '}', '\n'), true
}

// appendJSONValue appends the detail values the daemon records.
func appendJSONValue(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), true
	case string:
		return appendJSONString(b, v), true
	case bool:
		return strconv.AppendBool(b, v), true
	case int:
		return strconv.AppendInt(b, int64(v), 10), true
	case int64:
		return strconv.AppendInt(b, v, 10), true
	case uint64:
		return strconv.AppendUint(b, v, 10), true
	case float64:
		return appendJSONFloat(b, v)
	case []string:
		if v == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		for i, s := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, s)
		}
		return append(b, ']'), true
	}
	return b, false
}

// appendJSONFloat formats as encoding/json does: the shortest decimal,
// exponent form outside [1e-6, 1e21), "e-07" shortened to "e-7".
func appendJSONFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s as encoding/json does without HTML escaping:
// '"' and '\\' escaped, control characters as \b \f \n \r \t or \u00XX,
// invalid UTF-8 as \ufffd, U+2028 and U+2029 as \u2028 and \u2029.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
