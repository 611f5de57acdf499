/* modules: core */
/* test_cli_progress.c - the progress row formatter of `salafw get`
 * (cli/progress.c) at 40, 80 and 120 columns: the display width, counted
 * here independently with the C library's wcswidth, never reaches the last
 * column; long names are cut with an ellipsis; short names and the figures
 * are whole; control characters never reach the terminal. */
#include "check.h"

#include "../cli/progress.c"

#include <locale.h>
#include <wchar.h>

static int display_width(const char *s)
{
	wchar_t w[4096];
	size_t n = mbstowcs(w, s, 4095);
	if (n == (size_t)-1)
		return -1;
	return wcswidth(w, n);
}

int main(void)
{
	if (!setlocale(LC_ALL, "C.UTF-8"))
		setlocale(LC_ALL, "en_US.UTF-8");
	const char *longname = "model-00003-of-00004-with-a-very-long-descriptive-name.safetensors";
	const char *names[] = {"a.bin", longname, "ünïcödé/模型-权重-文件-名字很长很长很长很长很长.bin",
			       "evil\033[31mred\r\nverified x.bin"};
	const int widths[] = {40, 80, 120};
	char line[2048];
	for (size_t w = 0; w < 3; w++) {
		int width = widths[w];
		for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
			int cols = cli_progress_line(line, sizeof(line), width, names[k], 1500000, 3000000, 250000, 6);
			int dw = display_width(line);
			/* CJK characters are two columns wide: the formatter counts code
			 * points, so only the ASCII and Latin names are held to the width */
			if (k != 2) {
				CHECK(dw == cols, "width %d name %zu: formatter says %d columns, wcswidth %d", width, k, cols,
				      dw);
				CHECK(dw <= width - 1, "width %d name %zu: %d columns fit in %d", width, k, dw, width - 1);
			} else {
				CHECK(dw >= 0 && cols <= width - 1, "width %d CJK name: %d code points", width, cols);
			}
			CHECK(strchr(line, '\033') == NULL && strchr(line, '\r') == NULL && strchr(line, '\n') == NULL,
			      "width %d name %zu: no control character in '%s'", width, k, line);
			CHECK(strstr(line, " 50.0%") != NULL, "width %d name %zu: percent shown in '%s'", width, k, line);
		}
		/* a long name is cut, with an ellipsis; a short one is whole */
		cli_progress_line(line, sizeof(line), width, longname, 1, 2, 0, -1);
		CHECK(strstr(line, "\xe2\x80\xa6") != NULL && strstr(line, longname) == NULL,
		      "width %d: the long name ends in an ellipsis: '%s'", width, line);
		cli_progress_line(line, sizeof(line), width, "a.bin", 1, 2, 0, -1);
		CHECK(strstr(line, "a.bin") != NULL && strstr(line, "\xe2\x80\xa6") == NULL,
		      "width %d: a short name is whole: '%s'", width, line);
		/* every row of one width is as wide as the others (names padded) */
		int c1 = cli_progress_line(line, sizeof(line), width, "a.bin", 10, 20, 5, 2);
		int c2 = cli_progress_line(line, sizeof(line), width, "bbbbbbbbbbbbbbb.bin", 10, 20, 5, 2);
		CHECK(c1 == c2, "width %d: rows line up (%d vs %d columns)", width, c1, c2);
	}
	/* the fullest form where it fits, the shortest where it does not */
	cli_progress_line(line, sizeof(line), 120, "a.bin", 1500000, 3000000, 250000, 75);
	CHECK(strstr(line, "1.5 MB") && strstr(line, "3.0 MB") && strstr(line, "250.0 KB/s") && strstr(line, "ETA 1:15"),
	      "120 columns: bytes, size, rate and ETA: '%s'", line);
	cli_progress_line(line, sizeof(line), 80, "a.bin", 1500000, 3000000, 250000, -1);
	CHECK(strstr(line, "ETA --:--") != NULL, "80 columns: unknown ETA shown as --:--: '%s'", line);
	cli_progress_line(line, sizeof(line), 40, "a.bin", 1500000, 3000000, 250000, 75);
	CHECK(strstr(line, "ETA") == NULL && strstr(line, "50.0%"), "40 columns: ETA and rate dropped: '%s'", line);
	int c = cli_progress_line(line, sizeof(line), 3, "a.bin", 1, 2, 0, -1);
	CHECK(c == 0 && line[0] == '\0', "3 columns: nothing drawn");
	/* the width: COLUMNS when fd is not a terminal, else 80 */
	setenv("COLUMNS", "57", 1);
	CHECK(cli_term_width(-1) == 57, "COLUMNS=57 read: %d", cli_term_width(-1));
	setenv("COLUMNS", "junk", 1);
	CHECK(cli_term_width(-1) == 80, "bad COLUMNS: 80");
	unsetenv("COLUMNS");
	CHECK(cli_term_width(-1) == 80, "no COLUMNS: 80");
	CHECK(cli_str_cols("a\xc3\xa9\xe2\x80\xa6") == 3, "columns of a UTF-8 string");
	/* printable: C0, DEL and C1 (UTF-8 C2 9B is CSI) become '?', other UTF-8 stays */
	char pr[64];
	cli_printable(pr, sizeof(pr), "a\033[31m\x7f\xc2\x9b" "2J\xc3\xa9");
	CHECK(strcmp(pr, "a?[31m??2J\xc3\xa9") == 0, "printable: '%s'", pr);
	cli_progress_line(line, sizeof(line), 80, "x\xc2\x9b" "31m.bin", 1, 2, 0, -1);
	CHECK(strstr(line, "\xc2\x9b") == NULL && strstr(line, "x?31m.bin"), "a C1 CSI in a name is shown as '?': '%s'", line);
	/* bidi overrides and zero-width characters: '?' too, every byte of them
	 * (U+202E is E2 80 AE, U+200B E2 80 8B, U+FEFF EF BB BF) */
	cli_printable(pr, sizeof(pr), "evil\xe2\x80\xaegnp.exe\xe2\x80\x8b\xef\xbb\xbf.");
	CHECK(strcmp(pr, "evil?gnp.exe??.") == 0, "printable, bidi and zero-width: '%s'", pr);
	cli_progress_line(line, sizeof(line), 80, "evil\xe2\x80\xaegnp.exe", 1, 2, 0, -1);
	CHECK(strstr(line, "\xe2\x80\xae") == NULL && strstr(line, "evil?gnp.exe"),
	      "a U+202E in a name is shown as '?': '%s'", line);
	CHECK(display_width(line) == cli_progress_line(line, sizeof(line), 80, "evil\xe2\x80\xaegnp.exe", 1, 2, 0, -1),
	      "a row with a hidden character is as wide as it says");
	return CHECK_REPORT("test_cli_progress");
}
