// The tape page's style and script (src/io/tape_html.css and tape_html.js), built into
// the library by cmake/embed_text.cmake: ag_tape_html writes them into every page.
#ifndef ATTOGRAD_IO_TAPE_HTML_ASSETS_H
#define ATTOGRAD_IO_TAPE_HTML_ASSETS_H

#include <stddef.h>

extern const unsigned char agi_tape_html_css[], agi_tape_html_js[];
extern const size_t agi_tape_html_css_size, agi_tape_html_js_size;

#endif
