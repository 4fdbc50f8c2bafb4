package engine

import (
	"errors"
	"strings"
	"testing"
)

// The guard's refusal is told from all_acquire's own error 1690, a held
// name, by its text; a plain 1690 is no guard.
func TestSessionGuard_text(t *testing.T) {
	for _, tc := range []struct {
		msg, want string
	}{
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '18446744073709551615 + (@@autocommit = 0 or @@in_transaction = 1)'", "autocommit"},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '(18446744073709551615 + ( = 0))'", "autocommit"},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '((18446744073709551615 + ( = 0)) + (abs(timestampdiff(MICROSECOND,now(6),sysdate(6))) > 1000000))'", "session timestamp"},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '(18446744073709551615 + 1)'", "autocommit"},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '(18446744073709551615 + gt(abs(timestampdiff(MICROSECOND, 2001-09-09 01:46:40.000000, sysdate(6))), 1000000))'", "session timestamp"},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '`test`.`t`.`fence` + 1 + 18446744073709551615'", ""},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '(plus(test.t.fence, 1) + 18446744073709551615)'", ""},
		{"Error 1690 (22003): target: single.0.primary: vttablet: rpc error: code = InvalidArgument desc = BIGINT value is out of range in '(last_insert_id((`t`.`fence` + 1)) - 1)' (errno 1690) (sqlstate 22003) (CallerID: userData1): Sql: \"update t set fence = LAST_INSERT_ID(fence + 1) - 1 where (18446744073709551615 + (:__vtautocommit = 0) + (ABS(timestampdiff(microsecond, now(6), sysdate(6))) > 1000000)) * 0 = 0\"", ""},
		{"Error 1690 (22003): target: single.0.primary: vttablet: rpc error: code = InvalidArgument desc = BIGINT UNSIGNED value is out of range in '(18446744073709551615 + (0 = 0))' (errno 1690) (sqlstate 22003) (CallerID: userData1): Sql: \"update t set fence = 0 where (18446744073709551615 + (:__vtautocommit = 0) + (ABS(timestampdiff(microsecond, now(6), sysdate(6))) > 1000000)) * 0 = 0\"", "autocommit"},
		{"Error 1690 (22003): BIGINT UNSIGNED value is out of range in '18446744073709551615 + (@@autocommit = 0 or @@in_transaction = 1 and ascii(right(user(),1)) not in (0,64)) + (ascii(right(user(),1)) not in (0,64) and abs(timestampdiff(MICROSECOND,current_timestamp(6),sysdate(6))) > 1000000)'", "session timestamp"},
		{"Error 1690 (22003): BIGINT value is out of range in '9223372036854775807 + (ascii(right(user(),1)) not in (0,64) and @@read_only <> 0)'", "read_only"},
		{"Error 1690 (22003): BIGINT value is out of range in '(9223372036854775807 + ((ascii(right(user(),1)) not in (0,64)) and ( <> 0)))'", "read_only"},
		{"Error 1690 (22003): BIGINT value is out of range in '(9223372036854775807 + 1)'", "read_only"},
		{"Error 1690 (22003): BIGINT value is out of range in '9223372036854775807 + 1 + `test`.`t`.`fence`'", "read_only"},
		{"Error 1690 (22003): BIGINT value is out of range in '`test`.`t`.`fence` + 9223372036854775807'", ""},
		{"Error 1205 (HY000): Lock wait timeout exceeded", ""},
	} {
		got := SessionGuard(errors.New(tc.msg))
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("SessionGuard(%q) = %q, want one naming %q", tc.msg, got, tc.want)
		}
	}
}
