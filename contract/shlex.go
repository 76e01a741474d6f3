package contract

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Shell-word splitting for sandbox::exec's one-string shape. It follows
// POSIX shell quoting (single quotes literal, double quotes with the four
// backslash escapes, backslash outside quotes) and nothing else: no
// expansion, globbing, pipes, redirection, operators or comments, because
// exec runs a program, not a shell. "a && b" is three words.

var (
	errUnterminatedSingle = errors.New("unterminated single quote")
	errUnterminatedDouble = errors.New("unterminated double quote")
	errTrailingBackslash  = errors.New("trailing backslash escapes nothing")
)

// isShellSpace reports whether r separates words. Unicode spaces count, the
// same test the exec shape decision uses, so a command the decoder treats
// as a command line is also split on the space that made it one.
func isShellSpace(r rune) bool { return unicode.IsSpace(r) }

// Split splits s into words. Bytes that are not valid UTF-8 are kept as
// they are.
func Split(s string) ([]string, error) {
	var (
		words  []string
		cur    strings.Builder
		inWord bool
	)
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch c {
		case '\\':
			if i+1 >= len(s) {
				return nil, errTrailingBackslash
			}
			if s[i+1] == '\n' {
				// A line continuation joins the lines and adds nothing.
				i += 2
				continue
			}
			_, size := utf8.DecodeRuneInString(s[i+1:])
			cur.WriteString(s[i+1 : i+1+size])
			inWord = true
			i += 1 + size
		case '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errUnterminatedSingle
			}
			cur.WriteString(s[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case '"':
			n, err := readDouble(s[i+1:], &cur)
			if err != nil {
				return nil, err
			}
			inWord = true
			i += n + 1
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError && isShellSpace(r) {
				flush()
			} else {
				cur.WriteString(s[i : i+size])
				inWord = true
			}
			i += size
		}
	}
	flush()
	return words, nil
}

// readDouble copies a double-quoted run that starts just after the opening
// quote into cur and returns how many bytes it consumed, closing quote
// included.
func readDouble(s string, cur *strings.Builder) (int, error) {
	for i := 0; i < len(s); {
		switch s[i] {
		case '"':
			return i + 1, nil
		case '\\':
			if i+1 >= len(s) {
				return 0, errUnterminatedDouble
			}
			switch s[i+1] {
			case '\\', '"', '$', '`':
				cur.WriteByte(s[i+1])
			case '\n':
			default:
				// Inside double quotes a backslash before any other
				// character is literal.
				cur.WriteByte('\\')
				cur.WriteByte(s[i+1])
			}
			i += 2
		default:
			cur.WriteByte(s[i])
			i++
		}
	}
	return 0, errUnterminatedDouble
}

// Quote returns word in a form Split reads back as that one word.
func Quote(word string) string {
	if word == "" {
		return "''"
	}
	safe := true
	for i := 0; i < len(word); i++ {
		c := word[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("_@%+=:,./-", c) >= 0) {
			safe = false
			break
		}
	}
	if safe {
		return word
	}
	return "'" + strings.ReplaceAll(word, "'", `'\''`) + "'"
}

// Join quotes each word and joins them with spaces; Split(Join(w)) == w.
func Join(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = Quote(w)
	}
	return strings.Join(q, " ")
}
