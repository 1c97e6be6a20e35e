# Edits of a safetensors file in place, for the example tests' corrupt and crafted
# checkpoints (sourced: bash, perl).

# edit_meta FILE KEY VALUE: sets one metadata value of a safetensors file.
edit_meta() {
  perl -e '
    my ($f, $k, $v) = @ARGV;
    open(my $h, "<:raw", $f) or die "$f: $!"; local $/; my $all = <$h>; close $h;
    my $n = unpack("Q<", substr($all, 0, 8));
    my ($json, $data) = (substr($all, 8, $n), substr($all, 8 + $n));
    $json =~ s/"\Q$k\E":"[^"]*"/"$k":"$v"/ or die "no $k in $f";
    $json .= " " x ((8 - length($json) % 8) % 8);
    open($h, ">:raw", $f) or die "$f: $!"; print $h pack("Q<", length $json), $json, $data;' "$@"
}

# poke FILE TENSOR HEX [BYTE]: overwrites a tensor's data from its first byte (or BYTE on).
poke() {
  perl -e '
    my ($f, $t, $hex, $at) = @ARGV;
    open(my $h, "+<:raw", $f) or die "$f: $!"; read($h, my $len, 8); my $n = unpack("Q<", $len);
    read($h, my $json, $n);
    $json =~ /"\Q$t\E":\{[^}]*"data_offsets":\[(\d+),/ or die "no $t in $f";
    seek($h, 8 + $n + $1 + ($at // 0), 0); print $h pack("H*", $hex);' "$@"
}
